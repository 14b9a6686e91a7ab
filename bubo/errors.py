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


class RequestError(BuboError, ValueError):
    """A request's field is malformed or asks for what cannot be done: a bad tools list, two
    output constraints, a schema whose keyword no grammar enforces. code is the server's error
    code for it ("invalid_value", "unsupported_schema", ...); the message names the field. The
    library raises it as it is; the server answers it as a 400 with that code."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message
