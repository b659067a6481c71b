"""Rendering results for people: images (PNG grids) now; console, JSON and HTML reports as they land."""
