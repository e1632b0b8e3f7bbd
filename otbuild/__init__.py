"""otbuild: declarative, content-addressed builds of agentic training data."""

__version__ = "0.1.0"
