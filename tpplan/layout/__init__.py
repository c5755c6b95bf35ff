"""tpplan.layout"""
