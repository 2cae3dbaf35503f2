"""torchdata 0.9's ``datapipes.iter.util`` module path, for imports that reached into it."""
