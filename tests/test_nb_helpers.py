"""The notebook helpers: ``nb.show_source`` labels a function with the file it is written in, a decorated one too."""

from mimo_kit import nb
from mimo_kit.infra import timeline


def test_show_source_labels_a_decorated_function_with_its_own_file(capsys):
    nb.show_source(timeline.span)  # a @contextlib.contextmanager: its wrapper lives in contextlib.py
    label, *body = capsys.readouterr().out.splitlines()
    assert label == "# mimo_kit/infra/timeline.py" and any(line.startswith("def span(") for line in body)
    nb.show_source(nb.show_source)
    assert capsys.readouterr().out.startswith("# mimo_kit/nb.py\n")
