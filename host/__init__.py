"""The host: driver wrapper, backends, submission ring, run loop, publisher and command line."""
__version__ = "0.1.0"
