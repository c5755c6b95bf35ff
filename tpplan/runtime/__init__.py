"""tpplan.runtime"""
