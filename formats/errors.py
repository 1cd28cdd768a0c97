"""Errors a reader raises instead of returning wrong numbers."""


class FormatError(ValueError):
    """The bytes are not a valid tensorpress stream."""


class TruncatedError(FormatError):
    """The stream ends before the bytes its index promises."""


class ChecksumError(FormatError):
    """A checksum does not match: the bytes were corrupted."""


class UnsupportedVersionError(FormatError):
    """The stream was written by a newer format version than this reader knows."""


class UnknownCodecError(FormatError):
    """The stream names a codec this installation does not have."""
