"""The package version: a module of its own, so that no module imports the package face for it."""

__version__ = "0.1.0"
