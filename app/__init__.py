"""agentstate: the state service AI agents keep their memory in."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("agentstate")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0.0.0+unknown"
