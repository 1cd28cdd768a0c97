"""HDF5-aware shuffled-index data loading."""
