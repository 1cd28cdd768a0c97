/* The `sz` predictors by id (compress/sz/steps.py PREDICTORS): the dimensions each folds
 * a chunk to, whether side information precedes the codes, and its decoder. An entry
 * without a decoder is a valid payload this build refuses as TP_E_UNSUPPORTED. */
#include "sz.h"

const tp_sz_predictor tp_sz_predictors[TP_SZ_NPRED] = {
    [TP_SZ_RAW] = {1, 0, NULL, NULL},
    [TP_SZ_LORENZO] = {4, 0, tp_sz_lorenzo_decode, NULL},
    [TP_SZ_LINEAR] = {3, 0, tp_sz_interp_decode, NULL},
    [TP_SZ_CUBIC] = {3, 0, tp_sz_interp_decode, NULL},
    [TP_SZ_MD_LINEAR] = {3, 0, tp_sz_interp_md_decode, NULL},
    [TP_SZ_MD_CUBIC] = {3, 0, tp_sz_interp_md_decode, NULL},
    [TP_SZ_CONSTANT] = {1, 0, tp_sz_constant_decode, NULL},
    [TP_SZ_REGRESSION] = {3, 1, tp_sz_regression_decode, NULL},
    [TP_SZ_LINEAR_REV] = {3, 0, tp_sz_interp_decode, NULL},
    [TP_SZ_CUBIC_REV] = {3, 0, tp_sz_interp_decode, NULL},
    [TP_SZ_LATTICE] = {4, 0, tp_sz_lattice_decode, NULL},
    [TP_SZ_FITTED] = {3, 1, tp_sz_fitted_decode, NULL},
    [TP_SZ_MATCH] = {2, 1, tp_sz_match_decode, NULL},
    [TP_SZ_PIVOT] = {2, 1, tp_sz_pivot_decode, tp_sz_pivot_side_codes},
    [TP_SZ_WAVELET] = {4, 1, tp_sz_wavelet_decode, NULL},
    [TP_SZ_CDF97] = {4, 1, tp_sz_cdf97_decode, NULL},
};
