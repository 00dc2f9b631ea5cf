"""The run: the loop, the submission ring, the publisher, what a run records about itself, the
digest replay.
"""
