"""Errors every layer may raise or catch."""


class UnusableObject(Exception):
    """An object exists but cannot be used as it is (it cannot even be read); asking again will
    not help, and nothing prepared before stands in for it."""
