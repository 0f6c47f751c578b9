"""mimo_kit: every mechanism of the MiMo-V2.6 report at scale knobs, one chapter at a time."""

__version__ = "0.1.0"
