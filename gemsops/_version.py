"""The package version, in one place: pyproject.toml reads it (without
importing gemsops) and gemsops/__init__.py re-exports it."""

__version__ = "0.1.0"
