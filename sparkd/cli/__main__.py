from sparkd.cli.sparkd import main

main()
