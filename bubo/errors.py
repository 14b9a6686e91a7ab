"""Exception types raised by bubo's native layer and its Python API."""


class BuboError(Exception):
    """Base class of every bubo error."""


class GGUFError(BuboError, ValueError):
    """A GGUF file could not be read: missing, not GGUF, malformed or truncated.

    The message names the file and says what is wrong and where (the byte offset, the key or
    the tensor)."""


class UnsupportedError(GGUFError):
    """A well-formed file asks for something bubo does not run: a GGUF version, a tensor block
    type (IQ*, TQ*, MXFP4, ...) or a model architecture. The message names it."""
