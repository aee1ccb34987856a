from optiml.cli import main

main()
