"""Model building blocks; tensor-parallel aware, each parameter carries its own `weight_loader`."""
