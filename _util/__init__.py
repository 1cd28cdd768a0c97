"""The ground floor: thread pools, scratch buffers, the numba cache, hashing, optional torch.

Every layer may import these modules; they import nothing of tensorpress but each other.
"""
