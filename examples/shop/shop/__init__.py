"""An example merchant project: one flow kind of its own on durapay (docs/deploys.md)."""
