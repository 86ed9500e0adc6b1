"""powerfleet.workers"""
