"""Model providers: each turns a Call into raw text and usage; none of them validates. The one
named "simulated" is :mod:`batchjson.testing.simulated`, which offers itself by that name."""
