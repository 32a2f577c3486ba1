"""Errors every layer may raise or catch."""


class UnusableObject(Exception):
    """An object exists but cannot be used as it is (it cannot even be read); asking again will
    not help, and nothing prepared before stands in for it."""


class SpecError(ValueError):
    """An object's field is not of the shape its API allows: `path` names the field, the
    message what it holds and what is allowed. Raised by the strict readers (e.g.
    `cnidra.api.claimspec.decode_spec`); the lenient ones report into an `Issues` instead."""

    def __init__(self, path: object, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message
