from vortos_tui.console import main

main()
