from cnidra.cli.main import main

main()
