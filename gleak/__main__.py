from gleak.cli import main

main()
