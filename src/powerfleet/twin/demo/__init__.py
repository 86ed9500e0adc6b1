"""powerfleet.twin.demo"""
