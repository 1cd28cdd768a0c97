"""A PSNR target searched over a codec's paths, as ``tp.compress(x, psnr=...)`` searches
it: the bound for the codec as given first, then for each alternative the codec offers
at the bits per value that search reached (:meth:`~Codec.psnr_alternatives`, e.g.
``sz``'s CDF 9/7 path at few bits per value); the path whose stream takes the fewest
bytes at the target is kept (the codec as given on a tie).
"""

from __future__ import annotations

from collections.abc import Callable

from ..compress.codec import Codec
from ..compress.quality import Trial


def search_paths(
    codec: Codec, values: int, search: Callable[[Codec], Trial]
) -> tuple[Codec, Trial, dict]:
    """(the codec kept, its trial, the path record) for ``codec``'s PSNR search.

    ``search(c)`` runs the whole bound search for codec ``c`` and returns the kept
    :class:`Trial`, its ``result`` the stored bytes at that bound; ``values``: the
    elements those bytes hold (bits per value = 8 x bytes / values). The record is
    :func:`path_record`'s.
    """
    best, kept = search(codec), codec
    alternatives = codec.psnr_alternatives(8.0 * best.result / max(values, 1))
    for alt in alternatives:
        trial = search(alt)
        if trial.result < best.result:
            best, kept = trial, alt
    return kept, best, path_record(codec, alternatives, kept)


def path_record(given: Codec, alternatives: tuple, kept: Codec) -> dict:
    """``{"path": {parameter: value}}``: the kept codec's values of the parameters in
    which the searched codecs differ (``{"predictor": "cdf97"}`` or ``{"predictor":
    "auto"}`` for ``sz``); ``{}`` when the codec as given was the only one searched."""
    if not alternatives:
        return {}
    mine, base = kept.parameters(), given.parameters()
    keys = sorted(
        {k for alt in alternatives for k, v in alt.parameters().items() if base.get(k) != v}
    )
    return {"path": {k: mine.get(k) for k in keys}}
