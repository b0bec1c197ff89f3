"""HTTP layer: dependencies and route modules (thin handlers over ``crud``)."""
