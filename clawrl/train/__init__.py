"""Training: the shared clipped-surrogate loss, per-method advantages, and the trainer loop."""
