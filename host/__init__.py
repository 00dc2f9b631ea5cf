"""The host: driver wrapper, submission ring, run loop and command line."""
__version__ = "0.1.0"
