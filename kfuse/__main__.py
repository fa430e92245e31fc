from kfuse.cli import main

main()
