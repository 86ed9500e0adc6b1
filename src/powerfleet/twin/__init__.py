"""powerfleet.twin"""
