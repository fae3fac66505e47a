"""The copy engine's one error type (no torch: the package imports it eagerly)."""


class CopyEngineError(RuntimeError):
    """The copy engine cannot work here; the message names what is wrong and the fix."""
