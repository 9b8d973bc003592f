"""The startup file every Python kernel runs (`--IPKernelApp.exec_files`, see kernel.py).

It runs in the user's namespace, so everything happens inside one function that is deleted
afterwards. It registers two display formatters on the kernel's IPython:
    e2b/chart   a matplotlib Figure → charts.figure_to_chart (the SDK's `chart` field)
    e2b/data    a pandas DataFrame → its columns as lists (the SDK's `data` field)
Both look in sys.modules first, so displaying an int never imports matplotlib or pandas.
charts.py is loaded from beside this file by path: the kernel has no aenv on its sys.path.
A formatter that fails returns nothing: a chart is extra, never the reason a cell fails.
"""

from __future__ import annotations


def _aenv_install_formatters() -> None:
    import importlib.util
    import math
    import sys
    from pathlib import Path
    from typing import Any

    from IPython import get_ipython
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    here = Path(__file__).resolve().parent if "__file__" in globals() else None
    if here is None:
        return
    spec = importlib.util.spec_from_file_location("_aenv_charts", here / "charts.py")
    if spec is None or spec.loader is None:
        return
    charts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(charts)

    def clean(v: Any) -> Any:
        if hasattr(v, "isoformat"):
            return v.isoformat()
        if hasattr(v, "item"):
            v = v.item()
        if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
            return None
        return v

    class ChartFormatter(BaseFormatter):  # type: ignore[misc]
        format_type = Unicode("e2b/chart")
        print_method = ObjectName("_repr_e2b_chart_")
        _return_type = (dict,)

        def __call__(self, obj: Any) -> Any:
            mpl = sys.modules.get("matplotlib.figure")
            if mpl is None or not isinstance(obj, mpl.Figure):
                return super().__call__(obj)
            try:
                return charts.figure_to_chart(obj)
            except Exception:
                return None

    class DataFormatter(BaseFormatter):  # type: ignore[misc]
        format_type = Unicode("e2b/data")
        print_method = ObjectName("_repr_e2b_data_")
        _return_type = (dict,)

        def __call__(self, obj: Any) -> Any:
            pandas = sys.modules.get("pandas")
            if pandas is None or not isinstance(obj, pandas.DataFrame):
                return super().__call__(obj)
            try:
                return {str(k): [clean(v) for v in col]
                        for k, col in obj.to_dict(orient="list").items()}
            except Exception:
                return None

    shell = get_ipython()
    if shell is None:
        return
    display = shell.display_formatter
    for formatter in (ChartFormatter, DataFormatter):
        instance = formatter(parent=display)
        display.formatters[instance.format_type] = instance


_aenv_install_formatters()
del _aenv_install_formatters
