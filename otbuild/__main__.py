from otbuild.cli import main

main()
