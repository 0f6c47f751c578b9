"""A live loss plot for notebooks: a ``run_pretrain`` callback that redraws one figure in place."""

from __future__ import annotations


class LiveLossPlot:
    """``run_pretrain(cfg, callbacks=[LiveLossPlot(every=10)])``: training (smoothed) and validation loss.

    In JupyterLab the figure updates in place every ``every`` steps; headless it draws once at the end
    (call :meth:`finish`).
    """

    def __init__(self, every: int = 10, title: str = "pre-training loss"):
        self.every, self.title, self.handle, self.fig = every, title, None, None

    def _draw(self, log: dict) -> None:
        import matplotlib.pyplot as plt

        from mimo_kit import viz

        if self.fig is None:
            from matplotlib.backends.backend_agg import FigureCanvasAgg

            self.fig, self.ax = plt.subplots()
            plt.close(self.fig)  # displayed through the handle only
            FigureCanvasAgg(self.fig)  # closing may leave a bare canvas, which cannot measure tick labels
        self.ax.clear()
        viz.curves({"train": (log["tokens"], log["loss"])}, smoothing=0.8 if len(log["loss"]) > 5 else 0.0,
                   title=self.title, xlabel="tokens", ylabel="loss (nats/token)", ax=self.ax)
        if log["val_step"]:
            tokens = [log["tokens"][s - 1] for s in log["val_step"]]
            self.ax.plot(tokens, log["val_loss"], "o-", color=viz.PALETTE[1], label="validation")
            self.ax.legend()
        self.fig.tight_layout()

    def __call__(self, step: int, log: dict) -> None:
        if step % self.every:
            return
        self._draw(log)
        try:
            from IPython import get_ipython
            from IPython.display import display

            if get_ipython() is None:
                return
            if self.handle is None:
                self.handle = display(self.fig, display_id=True)
            else:
                self.handle.update(self.fig)
        except ImportError:
            pass

    def finish(self, log: dict, name: str = "ch03-pretrain-loss"):
        """Final redraw (and a PNG when headless); returns the figure."""
        from mimo_kit import viz

        self._draw(log)
        if self.handle is not None:
            self.handle.update(self.fig)
        viz.finish(self.fig, name)
        return self.fig
