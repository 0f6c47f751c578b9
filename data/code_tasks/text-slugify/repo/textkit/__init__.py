"""Text helpers."""
import re


def slugify(text):
    """Lower-case ASCII slug: words joined by single dashes, no leading or trailing dash."""
    text = text.lower()
    text = re.sub(r"[^a-z0-9]", "-", text)
    return text.strip("-")
