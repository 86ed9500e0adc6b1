"""powerfleet.cli"""
