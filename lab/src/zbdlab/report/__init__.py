"""Rendering of a comparison: tables (CSV/TSV/JSON), the HTML page, detail pages, the terminal table."""
