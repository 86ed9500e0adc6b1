from powerfleet.cli.main import main

main()
