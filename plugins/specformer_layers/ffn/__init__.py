"""Position-wise feed-forward networks."""
