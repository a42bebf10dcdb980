from kvsched.cli import main

main(prog_name="kvsched")
