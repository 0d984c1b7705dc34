"""The parts of ``benchmarks/doc_numbers.py``, which checks the measured numbers of README.md
and docs/ against the committed result files.

* ``sources``: the result files' paths, reading them, how a page may cite them;
* ``entries``: the kinds of entry (``Quote``, ``Block``, ``Unrecorded``, ``NotMeasured``);
* ``tables`` and ``tables_nystrom``: the renderers of the generated tables; ``blocks``: which
  table of which page comes from which files (``BLOCKS``);
* ``quote_values``: the values that sentences take from the files; ``quotes``: the sentences
  (``QUOTES``);
* ``passages``: the listed passages (``UNRECORDED``, ``NOT_MEASURED``).

They are imported with ``benchmarks/`` on the path, as it is when the script runs.
"""
