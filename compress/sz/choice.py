"""``sz``'s predictor choice: the candidates a config allows, sampled on blocks of the
chunk, the one whose codes cost fewest bits (as Huffman and zstd code them) kept.

The codec itself (config, payload layout, encode and decode) is in ``sz/codec.py``;
the steps it shares with this module (prediction dispatch, sampling, costs) in
``sz/steps.py``.
"""

from __future__ import annotations

import math

import numpy as np

from ..zstd import zstd_compress
from . import cdf97_choice
from . import fitted as sz_fitted
from . import match as sz_match
from . import pivot_fit as sz_pivot_fit
from .ids import (
    CDF97,
    CONSTANT,
    CUBIC,
    CUBIC_REV,
    FITTED,
    LATTICE,
    LINE_INTERP,
    LINEAR,
    LINEAR_REV,
    LORENZO,
    MATCH,
    MD_CUBIC,
    MD_LINEAR,
    PIVOT,
    REGRESSION,
    WAVELET,
)
from .steps import code_bits, encode_with, fold_shape, sample_blocks

#: predictor config name -> the predictor ids it samples
PREDICTOR_IDS = {
    "lorenzo": (LORENZO,),
    "linear": (LINEAR,),
    "cubic": (CUBIC,),
    "linear-rev": (LINEAR_REV,),
    "cubic-rev": (CUBIC_REV,),
    "md-linear": (MD_LINEAR,),
    "md-cubic": (MD_CUBIC,),
    "constant": (CONSTANT,),
    "regression": (REGRESSION,),
    "lattice": (LATTICE,),
    "fitted": (FITTED,),
    "match": (MATCH,),
    "pivot": (PIVOT,),
    "wavelet": (WAVELET,),
    "cdf97": (CDF97,),
    "interp": (LINEAR, CUBIC, MD_CUBIC, LINEAR_REV, CUBIC_REV),
    "auto": (
        *(LORENZO, LINEAR, CUBIC, MD_CUBIC, CONSTANT, REGRESSION, LINEAR_REV, CUBIC_REV),
        *(LATTICE, FITTED, MATCH, PIVOT),
    ),
}

#: a chunk whose last dimension is below this many elements may also be coded as
#: 1-d (e.g. 3x3 convolution kernels); the 1-d layout decodes faster there (long
#: lines instead of very short ones: the conv weight gradient of
#: benchmarks/compressors.py), so it is chosen unless the shaped one samples 2% fewer bits
_FLAT_BELOW = 8
_FLAT_SLACK = 1.02

#: (alpha, beta) pairs tried per interpolation when the config leaves them open
#: (tighter coarse levels pay off for cubic; for linear only slightly tighter ones, and
#: rarely: sampled among the higher orders; the multi-dimensional cubic untightened too:
#: kolmogorov_grf and grf_2d; docs/compressors.md, "What was tried")
LEVEL_TUNINGS = {
    LINEAR: ((1.0, 1.0), (1.125, 2.0)),
    CUBIC: ((1.0, 1.0), (1.25, 2.0)),
    LINEAR_REV: ((1.0, 1.0), (1.125, 2.0)),
    CUBIC_REV: ((1.0, 1.0), (1.25, 2.0)),
    MD_LINEAR: ((1.0, 1.0),),
    MD_CUBIC: ((1.0, 1.0), (1.25, 2.0)),
}


def _middle(values: np.ndarray) -> float:
    """The middle of the range of the (finite) ``values``: the constant prediction."""
    if values.size == 0:
        return 0.0
    mid = 0.5 * float(values.min()) + 0.5 * float(values.max())
    return mid if math.isfinite(mid) else 0.0


#: the line interpolations and their twins with each level's dimensions in reverse order
_REVERSED = {LINEAR: LINEAR_REV, CUBIC: CUBIC_REV}
#: when the sample blocks hold under ``_FEW`` elements each (chunks under 2M elements),
#: Lorenzo samples cheapest and an interpolation within ``_CLOSE`` of it, the two are
#: sampled again on blocks ``_LARGER`` times larger: on small blocks the points a level
#: extrapolates at the blocks' ends weigh more than in the chunk, so interpolation is
#: priced too high (docs/compressors.md, "What was tried"). Other near-ties are
#: left alone: sampling them again cost time and changed no choice on the corpus
_FEW = 4096
_CLOSE = 1.08
_LARGER = 4
#: on larger blocks, such a tie within ``_WHOLE_CLOSE`` is costed on the whole chunk and
#: the winner's codes kept (grf_2d at rel 1e-4: Lorenzo sampled 0.5% cheaper than the
#: cubic and cost 2.9% more whole; of the corpus's chunks only that one is this close)
_WHOLE_CLOSE = 1.02
_INTERPOLATIONS = (LINEAR, CUBIC, MD_LINEAR, MD_CUBIC, *LINE_INTERP)


def _rival(scored: list) -> tuple | None:
    """``(cost, candidate)`` of the cheapest interpolation when Lorenzo is the cheapest
    of ``scored`` (sorted by cost); else None."""
    if scored[0][1][0][0] != LORENZO:
        return None
    return next(((t, c) for t, c in scored if c[0][0] in _INTERPOLATIONS), None)


#: fewest dimensions of a chunk on which ``auto`` samples block-wise regression: on 2-d
#: chunks it won no array of benchmarks/compressors.py's corpus, and its sampling (the
#: costliest of the first candidates) was a tenth of the choice's time on small images
_REGRESSION_DIMS = 3

#: the fitted predictor (sz/fitted.py) is sampled by ``auto`` on chunks of at least
#: this many elements (its fit would cost much of a small image's compression time) and
#: kept where it samples at most ``_FITTED_GAIN`` of the next best candidate's bits: it
#: decodes slower than the fixed stencils (benchmarks/compressors.py). Against an
#: interpolation sampled within ``_FITTED_SURE`` of it, the interpolation is costed on
#: the whole chunk (see ``_fitted_margin``)
_FITTED_MIN = 1 << 19
_FITTED_GAIN = 0.9
_FITTED_SURE = 0.8

#: the configs that choose between predictors by sampling
_SEARCHES = ("auto", "interp")

#: the predictors of the 2-d layout's rows that ``auto`` tries where constant prediction
#: samples cheapest (noise-like rows, sz/match.py and sz/pivot.py); PIVOT only where the
#: constant's codes cost at least ``_PIVOT_RATE`` bits per value: its fit takes
#: milliseconds whatever the bound, several times the coding at lower rates
_ROW_MODELS = (MATCH, PIVOT)
_PIVOT_RATE = 10.0

#: predictors sampled first, on every layout; when constant prediction beats them
#: there, the neighbours do not predict the chunk and nothing else is sampled (on
#: noise-like chunks the rest lose too); else linear in the reverse dimension order
#: is sampled on the layout where linear did best, and then the higher orders (cubic,
#: multi-dimensional, linear with tighter coarse levels) on that layout and in the
#: better of the two orders. Both keep compression fast (benchmarks/compressors.py)
_FIRST = (LORENZO, LINEAR, CONSTANT, REGRESSION, LATTICE)


def _bits(scored_candidate: tuple) -> float:
    """The cost of a ``(cost, candidate)`` pair."""
    return scored_candidate[0]


def candidates(values, shape, predictor, alpha, beta, lattice=None) -> tuple[list, list]:
    """``(candidates, layouts)``: every ``((predictor id, alpha, beta), layout)`` the
    config allows, and the layouts: ``shape``, 2-d (3 or more dimensions, see
    ``FLAG_ROWS``) and 1-d (see ``_FLAT_BELOW``) where they apply. ``lattice``: the
    chunk's ``(offset, step)`` (sz/lattice.py), or None: then ``lattice`` is Lorenzo."""
    preds, middle = [], None
    for pred in PREDICTOR_IDS[predictor]:
        if pred == LATTICE:
            if lattice is not None:
                preds.append((LATTICE, *lattice))
            elif predictor == "lattice":
                preds.append((LORENZO, 1.0, 1.0))
        elif pred in (CONSTANT, *_ROW_MODELS):  # their side information: _modelled
            middle = _middle(values) if middle is None else middle
            preds.append((pred, middle, 1.0))
        elif pred in (LORENZO, REGRESSION, FITTED):  # FITTED: its model added by _fitted
            preds.append((pred, 1.0, 1.0))
        elif alpha is not None:
            preds.append((pred, alpha, beta))
        else:
            preds.extend((pred, a, b) for a, b in LEVEL_TUNINGS[pred])
    layouts = [shape]
    if len(shape) > 2:
        layouts.append((values.size // shape[-1], shape[-1]))
    if len(shape) > 1 and shape[-1] < _FLAT_BELOW:
        layouts.append((values.size,))
    search = predictor in _SEARCHES
    candidates = [
        (c, layout)
        for layout in layouts
        for c in preds
        if layout is layouts[-1] or c[0] != CONSTANT  # the layout does not change it
        # it paid on the chunk's own shape only, of 3 dimensions or more
        if c[0] != REGRESSION or layout is shape and (len(shape) >= _REGRESSION_DIMS or not search)
        if c[0] != FITTED or layout is shape  # its model is fitted on the chunk's shape
        # its rows: all dimensions but the last merged, of a chunk of 2 dimensions or more
        if c[0] not in _ROW_MODELS or layout is shape and (len(shape) > 1 or not search)
        # on one dimension the reverse order is the same: not sampled twice
        if len(layout) > 1 or c[0] not in _REVERSED.values() or not search
    ]
    return candidates, layouts


def choose(
    values, shape, eb, prec, pool, predictor, alpha, beta, radius, lattice=None, coded=None
) -> tuple[tuple, tuple]:
    """``((predictor id, alpha, beta), layout)``: the candidate whose sampled codes
    cost least, and the shape it codes the chunk as (see ``candidates``).
    values: the chunk, flat; shape: its squeezed shape; eb, prec, radius: the
    quantizer's bound, precision and radius; pool: threads for the sampling, or None;
    predictor, alpha, beta: the codec's config; lattice: see ``candidates``; coded: a
    dict receiving ``(codes, outliers, side)`` of the candidates coded whole here."""
    if predictor == "wavelet":  # opt-in: the chunk's own shape, nothing sampled
        return (WAVELET, 1.0, 1.0), shape
    if predictor == "cdf97":  # likewise; alpha: the quantization step in units of eb
        return (CDF97, cdf97_choice.step(values.reshape(shape), eb, prec, radius), 1.0), shape
    every, layouts = candidates(values, shape, predictor, alpha, beta, lattice)
    if len(every) == 1:
        return _alone(every[0], values, eb)
    later = [c for c in every if c[0][0] in _ROW_MODELS]  # tried after the sampling
    every = [c for c in every if c[0][0] not in _ROW_MODELS]
    flat = len(layouts[-1]) == 1 and len(shape) > 1

    samples = _sampled(values, shape, layouts, 1)

    def cost(candidate, samples=samples):
        cand, layout = candidate
        # constant prediction does not see the layout: its costs compare with the shape's
        blocks = samples[shape if cand[0] == CONSTANT else layout]
        if cand[0] == FITTED:
            return _fitted_cost(cand, blocks, layout, eb, prec, radius)
        side = []
        coded = [encode_with(cand, b, b.shape, eb, prec, radius, None, side) for b in blocks]
        codes = np.concatenate([c for c, _ in coded])
        bits = code_bits(codes) + 8 * sum(o.nbytes for _, o in coded)
        bits += 8 * len(zstd_compress(b"".join(side), 1)) if side else 0
        # the 1-d layout codes fast: it wins near-ties
        return bits * _FLAT_SLACK if flat and layout is not layouts[-1] else bits

    def costs(cands):
        return list(pool.map(cost, cands) if pool else map(cost, cands))

    def firsts(preds):  # the first tuning of a line interpolation (the rest: higher orders)
        return [
            c
            for c in every
            if c[0][0] in preds
            if c[0][0] not in LINE_INTERP or c[0][1:] == LEVEL_TUNINGS[LINEAR][0] or alpha
        ]

    first = firsts(_FIRST) or firsts((LINEAR_REV,))  # the latter: "linear-rev" alone
    scored = list(zip(costs(first), first, strict=True))
    rest = [c for c in every if c not in first]
    lines = [tc for tc in scored if tc[1][0][0] in LINE_INTERP]
    if lines:  # the higher orders: sampled on the layout and in the order linear did best
        if min(scored, key=_bits)[1][0][0] == CONSTANT:
            rest = []
        layout = min(lines, key=_bits)[1][1]
        twins = [c for c in firsts((LINEAR_REV,)) if c[1] is layout and c in rest]
        scored += zip(costs(twins), twins, strict=True)
        _, ((lin, _, _), _) = min(lines + scored[-len(twins) :] if twins else lines, key=_bits)
        order = LINE_INTERP[lin]
        rest = [
            c
            for c in rest
            if c not in twins
            if c[1] is layout and LINE_INTERP.get(c[0][0], order) == order or c[0][0] == FITTED
        ]
    rest = _with_models(rest, values, eb, predictor in _SEARCHES)
    scored = sorted(scored + list(zip(costs(rest), rest, strict=True)), key=_bits)
    scored = _one_tuning(scored, samples)
    points = sum(b.size for b in samples[shape])  # the shape's blocks: FITTED's samples
    chunk = (values, eb, prec, radius, pool, coded)
    scored = _fitted_margin(scored, predictor, values.size / points, chunk)
    scored = _regression_margin(scored)
    return _settle(scored, predictor, samples, (shape, layouts), chunk, later, cost)


def _settle(scored, predictor, samples, shapes, chunk, later, cost) -> tuple:
    """The chunk's ``(candidate, layout)`` from the sorted ``scored`` candidates: the
    CDF 9/7 path where it pays, a row model for noise-like rows, and near-ties settled
    on the whole chunk or on larger samples (``cost(candidate, samples)``)."""
    shape, layouts = shapes
    values, eb = chunk[:2]
    points = sum(b.size for b in samples[shape])
    (best_cost, best), rival = scored[0], _rival(scored)
    if predictor == "auto" and (found := cdf97_choice.pays(best_cost, best, samples, shape, chunk)):
        return found
    if best[0][0] == CONSTANT and later:  # noise-like rows: other rows or columns predict
        found = _row_model(later, values, eb, best_cost / points)
        if found is not None:
            return found
    few = samples[shape][0].size < _FEW and len(samples[shape]) > 1
    if rival is not None and not few and rival[0] <= _WHOLE_CLOSE * best_cost:
        pair = [best, rival[1]]  # the winner's codes are kept for the encoder
        return pair[int(np.argmin([_whole_cost(c, *chunk) for c in pair]))]
    if not few or rival is None or rival[0] > _CLOSE * best_cost:
        return best
    larger = _sampled(values, shape, layouts, _LARGER)
    pair = [best, rival[1]]
    return pair[int(np.argmin([cost(c, larger) for c in pair]))]


def _sampled(values, shape, layouts, scale) -> dict:
    """Sample blocks (``sample_blocks`` at ``scale``) per layout of ``layouts``; the 2-d
    layout's are the shape's blocks seen as 2-d, so that their costs compare."""
    rows = layouts[1] if len(shape) > 2 else None
    out = {
        layout: sample_blocks(values.reshape(fold_shape(layout, 3)), scale)
        for layout in layouts
        if layout is not rows
    }
    if rows is not None:
        out[rows] = [b.reshape(-1, b.shape[-1]) for b in out[shape]]
    return out


#: the multi-dimensional cubic untightened is kept over its tightened twin only where it
#: samples at least this many bits per sampled value fewer: sample blocks lack the
#: coarse levels where tightening pays, and put the untightened 0.02-0.05 bits per value
#: lower than whole chunks did (retina_grey at rel 1e-2: 0.007 fewer sampled, 0.025
#: more whole, 6% of its bytes; kolmogorov_grf and interface_rho at 1e-4: 0.07-0.08 fewer
#: sampled, 1.2-1.9% of their bytes fewer whole)
_UNTIGHTENED_MARGIN = 0.04


def _one_tuning(scored: list, samples: dict) -> list:
    """``scored`` (``(cost, candidate)`` pairs) without the multi-dimensional cubic's
    tuning that loses to its twin on the same layout (see ``_UNTIGHTENED_MARGIN``;
    ``samples``: the blocks per layout the costs were sampled on)."""
    md = [tc for tc in scored if tc[1][0][0] == MD_CUBIC]
    drop = []
    for plain in (tc for tc in md if tc[1][0][1:3] == (1.0, 1.0)):
        layout = plain[1][1]
        margin = _UNTIGHTENED_MARGIN * sum(b.size for b in samples[layout])
        for twin in (tc for tc in md if tc is not plain and tc[1][1] == layout):
            drop.append(twin if plain[0] + margin < twin[0] else plain)
    return [tc for tc in scored if not any(tc is d for d in drop)]


def _fitted(candidate: tuple, values, eb) -> tuple | None:
    """FITTED's ``(candidate, layout)`` with the chunk's model as its fourth item
    (sz/fitted.py), or None where no model fits (too few points, non-finite fit)."""
    (pred, alpha, beta), layout = candidate
    model = sz_fitted.fit(values.reshape(fold_shape(layout, 3)), eb)
    return ((pred, alpha, beta, model), layout) if model else None


def _alone(candidate: tuple, values, eb) -> tuple:
    """The only candidate of a config; FITTED's with its model, or Lorenzo's where no
    model fits; MATCH's and PIVOT's with their side information, or the constant's
    where it does not pay."""
    (pred, c, _), layout = candidate
    if pred in _ROW_MODELS:
        found = _modelled(candidate, values, eb)
        return found[0] if found else ((CONSTANT, c, 1.0), layout)
    if pred != FITTED:
        return candidate
    return _fitted(candidate, values, eb) or ((LORENZO, 1.0, 1.0), layout)


def _row_model(cands: list, values, eb, rate: float) -> tuple | None:
    """Of MATCH's and PIVOT's candidates in ``cands``, the one with its side information
    whose bits are the smallest share of the constant's, or None where neither pays.
    PIVOT is fitted where the constant's codes cost at least ``_PIVOT_RATE`` bits per
    value (``rate``)."""
    found = [
        _modelled(c, values, eb, rate) for c in cands if c[0][0] != PIVOT or rate >= _PIVOT_RATE
    ]
    found = [f for f in found if f is not None]
    return min(found, key=lambda f: f[1])[0] if found else None


def _modelled(candidate: tuple, values, eb, rate: float | None = None) -> tuple | None:
    """``(candidate, share)``: MATCH's or PIVOT's candidate with its side information
    (the row references; the model) as a fourth item, and its estimated bits as a share
    of the constant's (PIVOT: of ``rate`` bits per value, if known); None where it does
    not pay (sz/match.py, sz/pivot_fit.py)."""
    (pred, c, _), layout = candidate
    rows2 = values.reshape(fold_shape(layout, 2))
    if pred == MATCH:
        matched = sz_match.references(rows2, c, eb)
        if matched is None:
            return None
        refs, c, share = matched
        return ((MATCH, c, 1.0, sz_match.pack(refs)), layout), share
    fitted = sz_pivot_fit.fit(rows2, eb, rate)
    return None if fitted is None else (((PIVOT, c, 1.0, fitted[0]), layout), fitted[1])


def _with_models(cands: list, values, eb, search: bool) -> list:
    """``cands`` with FITTED's candidate given its model (``_fitted``), or without it
    where no model fits or, ``search``ing, the chunk is under ``_FITTED_MIN`` elements."""
    out = []
    for c in cands:
        if c[0][0] != FITTED:
            out.append(c)
        elif not (search and values.size < _FITTED_MIN) and (fitted := _fitted(c, values, eb)):
            out.append(fitted)
    return out


def _fitted_margin(scored: list, predictor: str, scale: float, chunk: tuple) -> list:
    """``scored`` (sorted by cost) with FITTED's candidate behind the next best unless it
    costs at most ``_FITTED_GAIN`` of that one's bits (it decodes slower), when the
    ``predictor`` config searches. Against an interpolation by less than
    ``_FITTED_SURE`` the interpolation is costed on the whole chunk (``chunk``:
    ``_whole_cost``'s arguments after the candidate), and FITTED's sampled cost scaled
    to it (``scale``: elements of the chunk per sampled one): sample blocks cut off the
    interpolations' coarse levels and overprice them, most at low rates, while the fit
    predicts every interior point alike (benchmarks/compressors.py)."""
    if len(scored) < 2 or scored[0][1][0][0] != FITTED or predictor not in _SEARCHES:
        return scored
    (fitted, _), (other, rival) = scored[:2]
    if rival[0][0] in _INTERPOLATIONS and _FITTED_SURE * other < fitted <= _FITTED_GAIN * other:
        fitted, other = fitted * scale, _whole_cost(rival, *chunk)
    if fitted <= _FITTED_GAIN * other:
        return scored
    return [scored[1], scored[0], *scored[2:]]


#: block-wise regression is kept over constant prediction only where it samples at most
#: this share of the constant's bits: it decodes about four times slower (tf_attn_probs
#: at rel 1e-4, the upper triangle's runs priced by sz/runs.py: 0.91 of the constant's
#: bits, 5% fewer bytes whole, 40% more decode time)
_REGRESSION_GAIN = 0.85


def _regression_margin(scored: list) -> list:
    """``scored`` (sorted by cost) with the cheapest constant prediction first where
    block-wise regression is cheapest by less than ``_REGRESSION_GAIN``."""
    if not scored or scored[0][1][0][0] != REGRESSION:
        return scored
    plain = next((tc for tc in scored if tc[1][0][0] == CONSTANT), None)
    if plain is None or scored[0][0] <= _REGRESSION_GAIN * plain[0]:
        return scored
    return [plain, *(tc for tc in scored if tc is not plain)]


def _whole_cost(candidate, values, eb, prec, radius, pool, coded) -> float:
    """What ``candidate``'s codes of the whole chunk cost, in bits (outliers included);
    the codes go into the dict ``coded`` if given (see ``choose``)."""
    (cand, layout), side = candidate, []
    codes, outliers = encode_with(cand, values, layout, eb, prec, radius, pool, side)
    if coded is not None:
        coded[candidate] = (codes, outliers, side)
    return code_bits(codes) + 8 * outliers.nbytes + 8 * sum(len(b) for b in side)


def _fitted_cost(cand, blocks, shape, eb, prec, radius) -> float:
    """The sampled cost of FITTED's candidate, in bits: per value of the sample blocks,
    the bits of its codes where the model predicts and where Lorenzo does (the edges,
    a larger share of a block than of most chunks), weighed by their shares of the chunk
    (``shape``), plus the model's bytes in the share of the chunk the blocks cover."""
    offsets = sz_fitted.unpack(cand[3])[0]
    inner, edge, points, outlier_bits = [], [], 0, 0.0
    for b in blocks:
        codes, outliers = encode_with(cand, b, b.shape, eb, prec, radius)
        b3 = fold_shape(b.shape, 3)
        mask = np.zeros(b3, bool)
        mask[sz_fitted.interior(b3, offsets)] = True
        inner.append(codes[mask.reshape(-1)])
        edge.append(codes[~mask.reshape(-1)])
        points += b.size
        outlier_bits += 8 * outliers.nbytes
    inner, edge = np.concatenate(inner), np.concatenate(edge)
    size = math.prod(shape)
    share = sz_fitted.interior_size(fold_shape(shape, 3), offsets) / size
    rate_in = code_bits(inner) / inner.size if inner.size else 0.0
    rate_edge = code_bits(edge) / edge.size if edge.size else rate_in
    rate = rate_in * share + rate_edge * (1 - share) if inner.size else rate_edge
    return rate * points + outlier_bits + 8 * len(cand[3]) * points / size
