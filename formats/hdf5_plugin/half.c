/* float32 to float16 bits, to nearest with ties to even: numpy's conversion
 * (npy_floatbits_to_halfbits), which `block` and the Python reader use for float16. */
#include "tp_decode.h"

uint16_t tp_half_from_float_bits(uint32_t f)
{
    uint16_t sign = (uint16_t)((f & 0x80000000u) >> 16);
    uint32_t exp = f & 0x7f800000u, sig = f & 0x007fffffu;
    if (exp >= 0x47800000u) { /* overflow to inf; inf and NaN stay so */
        if (exp == 0x7f800000u && sig != 0) {
            uint16_t nan = (uint16_t)(0x7c00u + (sig >> 13));
            return (uint16_t)(sign + (nan == 0x7c00u ? nan + 1 : nan));
        }
        return (uint16_t)(sign + 0x7c00u);
    }
    if (exp <= 0x38000000u) { /* a subnormal half, or signed zero */
        if (exp < 0x33000000u)
            return sign;
        exp >>= 23;
        sig = (0x00800000u + sig) >> (113 - exp);
        if ((sig & 0x00003fffu) != 0x00001000u || (f & 0x000007ffu))
            sig += 0x00001000u; /* round, but not a tie that is already even */
        return (uint16_t)(sign + (sig >> 13)); /* a carry makes the smallest normal */
    }
    uint16_t hexp = (uint16_t)((exp - 0x38000000u) >> 13);
    if ((sig & 0x00003fffu) != 0x00001000u)
        sig += 0x00001000u;
    return (uint16_t)(sign + hexp + (sig >> 13)); /* a carry rounds up the exponent */
}
