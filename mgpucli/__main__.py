"""``python -m mgpucli`` runs the CLI (this is also what torchrun's ``-m mgpucli`` starts)."""

from mgpucli.cli.app import main

if __name__ == "__main__":
    main()
