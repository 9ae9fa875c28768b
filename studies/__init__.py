"""Studies behind a decision: each measures one question once, writes its JSON under docs/bench, and is run
from the repository's top as `python -m studies.NAME` (README.md lists them). They import kvpot; kvpot never
imports them."""
