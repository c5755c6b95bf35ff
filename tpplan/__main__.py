from tpplan.cli import main

main()
