"""Figures for the comparison report, drawn with matplotlib's Agg backend and returned as data URIs."""
