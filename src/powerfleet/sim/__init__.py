"""powerfleet.sim"""
