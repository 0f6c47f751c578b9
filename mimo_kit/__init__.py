"""mimo_kit: the mechanisms of the MiMo-V2.6 report at scale knobs, one chapter at a time (docs/design.md)."""

__version__ = "0.1.0"
