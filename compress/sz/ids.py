"""``sz``'s predictor ids, as a payload's first byte records them (formats/SPEC.md),
and the groups the codec and the choice ask about."""

#: predictor ids
RAW, LORENZO, LINEAR, CUBIC, MD_LINEAR, MD_CUBIC, CONSTANT = 0, 1, 2, 3, 4, 5, 6
#: block-wise Lorenzo or linear regression (sz/regression.py)
REGRESSION = 7
#: linear and cubic interpolation with each level's dimensions in the reverse order
#: (the last first: kernels/interpolation.py's ``order=1``)
LINEAR_REV, CUBIC_REV = 8, 9
#: Lorenzo prediction of the indices of data on a lattice, coded losslessly (sz/lattice.py)
LATTICE = 10
#: a causal linear prediction fitted per chunk by least squares (sz/fitted.py)
FITTED = 11
#: each row of the 2-d layout predicted by an earlier row or a constant (sz/match.py)
MATCH = 12
#: the columns of the 2-d layout predicted from the columns before them (sz/pivot.py)
PIVOT = 13
#: the values' bins under a multilevel integer 5/3 wavelet (sz/wavelet.py)
WAVELET = 14
#: the values under a multilevel float CDF 9/7 wavelet, corrected where past the bound
#: (sz/cdf97.py)
CDF97 = 15
#: the predictors with side information in the payload (bytes, see ``steps.encode_with``)
WITH_SIDE = (REGRESSION, FITTED, MATCH, PIVOT, WAVELET, CDF97)
#: the predictors whose side information is carried by their choice
MODELLED = (FITTED, MATCH, PIVOT)
#: the interpolations of kernels/interpolation.py, and their dimension order
LINE_INTERP = {LINEAR: 0, CUBIC: 0, LINEAR_REV: 1, CUBIC_REV: 1}
#: the multi-dimensional interpolations (kernels/interp_md.py), coded in one thread
MULTI_DIM = (MD_LINEAR, MD_CUBIC)
