"""`python -m vortos_tui.cli`: the same as the `vortos` script."""

from vortos_tui.cli import main

main()
