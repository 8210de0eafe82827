"""The PyPI release files in the corpus, pinned by exact filename, URL and sha256.

Release files on PyPI are immutable (a filename can never be uploaded twice), so these bytes are the
same for everyone; the sha256 makes sure of it.
"""

from __future__ import annotations

from dataclasses import dataclass

FILES = "https://files.pythonhosted.org/packages"


@dataclass(frozen=True)
class Pin:
    group: str  # data/<group>/<name>/ in the corpus
    name: str
    filename: str
    url: str
    sha256: str
    extract: bool  # unpack into files, or keep the (already compressed) artifact as it is


DOCUTILS = Pin(
    "pypi-text", "docutils-0.20.1", "docutils-0.20.1.tar.gz",
    f"{FILES}/1f/53/a5da4f2c5739cf66290fac1431ee52aff6851c7c8ffd8264f13affd7bcdd/docutils-0.20.1.tar.gz",
    "f08a4e276c3a1583a86dce3e34aba3fe04d02bba2dd51ed16106244e8a923e3b", True,
)  # fmt: skip
PYYAML = Pin(
    "pypi-binary", "PyYAML-6.0.1-cp311-manylinux",
    "PyYAML-6.0.1-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    f"{FILES}/7b/5e/efd033ab7199a0b2044dab3b9f7a4f6670e6a52c089de572e928d2873b06/"
    "PyYAML-6.0.1-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    "d2b04aac4d386b172d5b9692e2d2da8de7bfb6c387fa4f801fbf6fb2e6ba4673", True,
)  # fmt: skip
TZDATA = Pin(
    "pypi-data", "tzdata-2024.1", "tzdata-2024.1-py2.py3-none-any.whl",
    f"{FILES}/65/58/f9c9e6be752e9fcb8b6a0ee9fb87e6e7a1f6bcab2cdc73f02bb7ba91ada0/tzdata-2024.1-py2.py3-none-any.whl",
    "9068bc196136463f5245e51efda838afa15aaeca9903f49050dfa2679db4d252", True,
)  # fmt: skip
DOCUTILS_ARCHIVE = Pin(
    "compressed", "docutils-0.20.1-sdist", DOCUTILS.filename, DOCUTILS.url, DOCUTILS.sha256, False
)  # fmt: skip
NUMPY = Pin(
    "pypi-binary", "numpy-1.26.4-cp311-manylinux",
    "numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    f"{FILES}/3a/d0/edc009c27b406c4f9cbc79274d6e46d634d139075492ad055e3d68445925/"
    "numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    "666dbfb6ec68962c033a450943ded891bed2d54e6755e35e5835d63f4f6931d5", True,
)  # fmt: skip
SYMPY = Pin(
    "pypi-text", "sympy-1.12", "sympy-1.12.tar.gz",
    f"{FILES}/e5/57/3485a1a3dff51bfd691962768b14310dae452431754bfc091250be50dd29/sympy-1.12.tar.gz",
    "ebf595c8dac3e0fdc4152c51878b498396ec7f30e7a914d6071e674d49420fb8", True,
)  # fmt: skip
SYMPY_ARCHIVE = Pin("compressed", "sympy-1.12-sdist", SYMPY.filename, SYMPY.url, SYMPY.sha256, False)
# The smallest pin, for tests of the download path (11 KiB).
SIX = Pin(
    "pypi-text", "six-1.16.0", "six-1.16.0-py2.py3-none-any.whl",
    f"{FILES}/d9/5a/e7c31adbe875f2abbb91bd84cf2dc52d792b5a01506781dbcf25c91daf11/six-1.16.0-py2.py3-none-any.whl",
    "8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254", True,
)  # fmt: skip

SMALL = (DOCUTILS, PYYAML, TZDATA, DOCUTILS_ARCHIVE)
FULL = (DOCUTILS, SYMPY, PYYAML, NUMPY, TZDATA, DOCUTILS_ARCHIVE, SYMPY_ARCHIVE)
