"""The reference answers to every chapter's exercises: one module per chapter (``ch04b.py`` answers chapter 4b),
each with ``solution(n)``, computed by the kit's own functions. :mod:`mimo_kit.exercises` checks a notebook's
answers against them; the instructor key derives each answer by hand."""
