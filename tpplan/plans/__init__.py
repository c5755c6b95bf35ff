"""tpplan.plans"""
