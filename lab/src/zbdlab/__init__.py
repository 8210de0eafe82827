"""zbdlab: run filesystem/block-compression studies and compare their results."""

__version__ = "0.1.0"
